"""Which aspects a review's own words give evidence of, and an answer's aspects kept to those (prompt.aspect_evidence).

A small model names aspects the review never mentions: the default 0.5B named 6.1 of the 8 per review where the
review talked about 4.2, breakfast and price in nearly every answer (`bench/aspect_quality.py`, README "Aspect
quality"). An aspect stored for a review is shown on the dashboard as that hotel's; one the text holds no word of is
the model's guess. The cues are words of each aspect in English and Chinese, matched anywhere in the text: a cue
that is present does not prove the review judged that aspect, but an aspect with none is dropped.
"""

from __future__ import annotations

import re

from qwenspark.schemas import ASPECTS

# English cues match whole words at their start ("clean" matches "cleaned", not "unclean"'s middle); the dev set's
# English reviews are lower-cased with their stop words taken out, so the cues are single words or fixed pairs.
_EN: dict[str, str] = {
    "room": r"rooms?|beds?|bedroom|bathrooms?|suites?|views?|decor\w*|spacious|cramped|tiny|furnish\w*|carpets?|"
            r"wallpaper|pillows?|sheets?|linens?|showers?|tubs?|bathtubs?|toilets?|closets?|windows?|balcon\w+",
    "service": r"staff|service|desk|reception\w*|concierge|manager|porters?|bell\w*|housekeep\w*|helpful|friendly|"
               r"rude|polite|courteous|attentive|check-?in|check-?out|welcom\w*|employees?|personnel|waiter|waitress|"
               r"bartenders?|doorm[ae]n|valet|unhelpful|accommodating|customer",
    "location": r"locat\w*|area|neighbou?rhood|walk\w*|nearby|near|close|downtown|subway|metro|station|convenient\w*|"
                r"central\w*|heart|district|beach|attractions?|airport|blocks?|steps|square|distance|far",
    "cleanliness": r"clean\w*|unclean\w*|dirty|filth\w*|spotless|stain\w*|dust\w*|mou?ld\w*|smell\w*|odou?r\w*|"
                   r"hairs?|bugs?|roach\w*|cockroach\w*|bedbugs?|tidy|hygien\w*|grim\w+|musty|sanitary|insects?",
    "breakfast/food": r"breakfast|food|restaurants?|dinner|lunch|buffet|meals?|coffee|tea|wine|bar|drinks?|eat\w*|"
                      r"dining|menu|snacks?|cafe|brunch|cheese|fruit|cook\w*|delicious|tasty",
    "price/value": r"prices?|priced|pricey|value|rates?|cost\w*|expensive|cheap\w*|afford\w*|deal|worth\w*|"
                   r"overpriced|money|paid|pay\w*|fees?|charg\w*|budget|bargain|dollars?|euros?|bucks",
    "facilities": r"facilit\w*|pool|gym|fitness|spa|parking|parked|elevators?|lifts?|lobby|wi-?fi|internet|"
                  r"air\W?condition\w*|a/c|heater|heating|hot water|water pressure|tv|television|amenit\w*|shuttle|"
                  r"business cent\w*|equipment|safe|mini-?bar|fridge|refrigerator|microwave|jacuzzi|sauna|laundry|"
                  r"toiletries|renovat\w*|upgrad\w*|boilers?|plumbing",
    "noise": r"nois\w*|loud\w*|quiet\w*|soundproof\w*|sounds?|hear\w*|heard|thin walls|earplugs?|sirens?|traffic|"
             r"construction|peaceful|insulat\w*|rattl\w*|banging",
}
# Chinese has no word boundaries: substrings, with the few that sit inside an unrelated word ruled out ("饭店" is a
# hotel, "卫生间" a bathroom, "离开" leaving); a currency sign before a number is matched here too, in any text.
_ZH: dict[str, str] = {
    "room": r"房间|客房|房型|床|卫生间|浴室|套房|标间|大床|景观|海景|视野|装修|窗|洗手间|马桶|浴缸|衣橱|柜子|壁纸",
    "service": r"服务|前台|态度|经理|接待|热情|礼貌|员工|门童|行李|手续|退房|办理|工作人员|管家|客服|总台|大堂副理",
    "location": r"位置|地理|交通|地段|市中心|附近|周边|周围|地铁|车站|机场|海边|景点|偏僻|较偏|比较偏|出行|方便|"
                r"离(?!开)[^，。,.！!]{0,12}(?:近|远|分钟|公里)|打的|出租车|步行",
    "cleanliness": r"干净|卫生(?!间)|脏|整洁|清洁|异味|霉|灰尘|蟑螂|虫|臭|消毒|污渍|头发",
    "breakfast/food": r"早餐|早饭|自助餐|餐厅|饭(?!店)|吃|菜|餐|食物|酒吧|咖啡|茶|水果|味道|小吃",
    "price/value": r"价|性价比|贵|便宜|实惠|划算|超值|不值|物有所值|\d+\s*元|块钱|收费|费用|房费|[$¥￥€£]\s?\d",
    "facilities": r"设施|设备|空调|热水|电视|宽带|网络|上网|网速|泳池|健身|停车|电梯|大堂|洗浴|暖气|冰箱|洗漱用品|"
                  r"吹风机|桑拿|商务中心|接送|班车|遥控器|锅炉|下水道|灯",
    "noise": r"吵|噪音|噪声|静|隔音|声音|喧闹|嘈杂|喇叭|迪厅|声",
}
assert set(_EN) == set(_ZH) == set(ASPECTS), "a cue list for every aspect"

_CUES: dict[str, re.Pattern[str]] = {
    a: re.compile(rf"\b(?:{_EN[a]})\b|{_ZH[a]}", re.IGNORECASE) for a in ASPECTS
}


def mentioned(text: str) -> frozenset[str]:
    """The aspects text holds a cue of."""
    return frozenset(a for a, cue in _CUES.items() if cue.search(text))


def evidenced(aspects: list[dict[str, str]], text: str) -> list[dict[str, str]]:
    """The answer's aspect mentions ({"aspect", "sentiment"}) whose aspect text holds a cue of, in their order."""
    found = mentioned(text)
    return [m for m in aspects if m["aspect"] in found]
